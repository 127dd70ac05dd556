"""``python -m kafka2pc.cli``: the ``kafka2pc`` command."""

from kafka2pc.cli import main

raise SystemExit(main())
