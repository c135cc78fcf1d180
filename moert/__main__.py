from moert.cli import main

raise SystemExit(main())
