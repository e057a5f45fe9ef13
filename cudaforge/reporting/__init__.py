"""Reports of benchmark and optimize runs: markdown text, and HTML with SVG charts."""
