"""`python -m trainer train|fetch [--job FILE]`: see trainer.train."""

from trainer.train import main

raise SystemExit(main())
