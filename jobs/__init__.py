"""The job as typed data: the spec (training config + provider section), safe YAML, redaction, shipping."""
