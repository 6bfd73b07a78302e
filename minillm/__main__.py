import sys

try:
    from .cli.commands import main
except KeyboardInterrupt:          # Ctrl-C while the command's modules still load: exit quietly
    sys.exit(130)
except BaseException as e:         # ... or Ctrl-C wrapped by Python, e.g. inside a class body's __set_name__
    from .errors import interrupted            # loaded by the package before this module ran
    if interrupted(e):
        sys.exit(130)
    raise

sys.exit(main())
