import sys

from tfaccel.cli.main import main

sys.exit(main())
