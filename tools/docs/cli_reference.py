"""Writes the command-line reference page from the commands' own help: `tierswap --help`, then
each subcommand's (and theirs, recursively), so the page says what the binary says.

    python3 tools/docs/cli_reference.py BUILD/tierswap OUT.md"""
import re
import subprocess
import sys


def help_of(cli, path):
    r = subprocess.run([cli, *path, "--help"], capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        sys.exit(f"cli_reference: `tierswap {' '.join(path)} --help` failed ({r.returncode}): "
                 f"{r.stderr.strip()}")
    return r.stdout.replace(cli, "tierswap")


def subcommands(text):
    """The names under CLI11's "Subcommands:" heading."""
    part = text.split("Subcommands:", 1)
    if len(part) == 1:
        return []
    return re.findall(r"^  (\S+)", part[1], re.M)


def pages(cli, path=()):
    text = help_of(cli, list(path))
    yield path, text
    for name in subcommands(text):
        yield from pages(cli, (*path, name))


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    cli, out = sys.argv[1], sys.argv[2]
    parts = ["# Command-line reference", "",
             "Each command's `--help`, as the binary prints it (generated at build time).", ""]
    for path, text in pages(cli):
        title = " ".join(("tierswap", *path))
        parts += [f"## `{title}`", "", "```text", text.rstrip(), "```", ""]
    with open(out, "w", encoding="utf-8") as f:
        f.write("\n".join(parts))


if __name__ == "__main__":
    main()
