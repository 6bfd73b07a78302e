import sys

try:
    from .cli.main import main
except KeyboardInterrupt:          # Ctrl-C while the command's modules still load: exit quietly
    sys.exit(130)

sys.exit(main())
