from opendecide.cli import main

main()
