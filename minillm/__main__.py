import sys

from .errors import interrupted

try:
    from .cli.commands import main
except BaseException as e:         # Ctrl-C while the command's modules still load: exit quietly
    if interrupted(e):
        sys.exit(130)
    raise

sys.exit(main())
