"""The command-line front-ends (click only): flags, printing and exit codes over the library."""
