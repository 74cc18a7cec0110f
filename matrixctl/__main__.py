"""`python -m matrixctl` runs the command line."""

from matrixctl.cli.app import main

raise SystemExit(main())
