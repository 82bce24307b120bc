"""trainfleet's front door: the CLI, the job spec, settings and the service functions."""
