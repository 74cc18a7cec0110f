"""`python -m matrixctl` runs the command line."""

from matrixctl.cli.entry import main

raise SystemExit(main())
