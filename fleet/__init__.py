"""trainfleet's CLI (`fleet`): typer commands over service/."""
