"""The top floor: the `zbopt` command line (`cli/`) and real runs in torch (`runtime/`).

Nothing is imported here: the command line loads what each command needs when it runs.
"""
