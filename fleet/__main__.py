from fleet.cli import main

main()
