from effect_ledger_client.cli import main

raise SystemExit(main())
