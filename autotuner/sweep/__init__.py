"""A sweep's life: created (create), run to its end (run, dispatcher, verdict), resumed, cancelled."""
