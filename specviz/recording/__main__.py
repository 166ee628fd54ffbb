"""`python -m specviz.recording`: the command lives with the app it drives (specviz/app/record.py)."""
import sys

from ..app.record import main

sys.exit(main())
