"""Issue 19's findings, one test each: a job's submitter cannot read, write or spend past the job."""
