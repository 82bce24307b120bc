"""`python -m trainer train|fetch|pack|check [...]`: see trainer.train; `check` (trainer.nodecheck) imports
nothing beyond the standard library first, so that a node lacking the trainer's libraries can say which."""

import sys

if sys.argv[1:2] == ["check"]:
    from trainer.nodecheck import main as check

    raise SystemExit(check(sys.argv[2:]))

from trainer.train import main

raise SystemExit(main())
