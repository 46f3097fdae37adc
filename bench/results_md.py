"""bench/RESULTS.md is shared by every benchmark: each one owns a section that starts with a
'## <heading>' line and replaces only that section when it writes."""
import os


def replace_section(text, heading, path="bench/RESULTS.md"):
    """Replaces the section whose first line starts with `heading` (up to the next '## '
    line) by `text`, in place, or appends it; other sections are kept. Written atomically."""
    try:
        with open(path) as f:
            lines = f.read().split("\n")
    except FileNotFoundError:
        lines = ["# Benchmark results", ""]
    start = next((i for i, l in enumerate(lines) if l.startswith(heading)), None)
    if start is None:
        while lines and lines[-1] == "":
            lines.pop()
        lines.append("")
        start = end = len(lines)
    else:
        end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")),
                   len(lines))
    new = lines[:start] + text.rstrip("\n").split("\n") + [""] + lines[end:]
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w") as f:
        f.write("\n".join(new).rstrip("\n") + "\n")
    os.replace(tmp, path)
