"""`python -m specviz.recording`: record a race (specviz/app/record.py), or with `figures RECORDING --out DIR`,
write a recording's figures as SVG and PNG files (specviz/app/figures.py). Both live with the app they drive."""
import sys

if sys.argv[1:2] == ["figures"]:
    from ..app.figures import main

    sys.exit(main(sys.argv[2:]))
from ..app.record import main

sys.exit(main())
