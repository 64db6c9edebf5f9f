"""``python -m spinf_stream.cli``: the ``spinf-stream`` command."""

from spinf_stream.cli.main import main

main()
