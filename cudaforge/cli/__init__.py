"""The `cudaforge` command: its subcommands, the demo, `doctor` and `bench`."""
