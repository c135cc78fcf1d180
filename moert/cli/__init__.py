"""The command line: one module per command group; main.py is the entry point (`moert`, `python -m moert`).

The top of the import graph: it may import every wing (serve, cluster, explain, cost) and the runtime; nothing
imports it but moert/__main__.py. argparse lives here and nowhere else (tests/test_structure.py).
"""
