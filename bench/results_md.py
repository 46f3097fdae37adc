"""bench/RESULTS.md is shared by every benchmark: each one owns a section that starts with a
'## <heading>' line and replaces only that section when it writes."""


def replace_section(text, heading, path="bench/RESULTS.md"):
    """Replaces the section starting with `heading` (a '## ...' prefix) by `text`, or appends
    it; the other sections are kept as they are."""
    try:
        old = open(path).read()
    except FileNotFoundError:
        old = "# Benchmark results\n"
    if heading in old:
        a = old.index(heading)
        b = old.find("\n## ", a + 1)
        old = old[:a] + (old[b + 1:] if b >= 0 else "")
    with open(path, "w") as f:
        f.write(old.rstrip("\n") + "\n\n" + text.rstrip("\n") + "\n")
