"""A parser for the tiny arithmetic language of tests/e2e/test_synth.sh (and
pipelines/arith.yaml): expr := term (('+'|'-') term)*, term := factor (('*'|'/') factor)*,
factor := digits | '(' expr ')'. Reads one sample on stdin; exit 0 when it parses, else
exit 1 with the problem on stderr (the synth validator's message)."""
import sys

s = sys.stdin.read().strip()
pos = 0


def fail(msg):
    sys.stderr.write(f"{msg} at offset {pos} of {s!r}")
    sys.exit(1)


def factor():
    global pos
    if pos < len(s) and s[pos] == "(":
        pos += 1
        expr()
        if pos >= len(s) or s[pos] != ")":
            fail("expected ')'")
        pos += 1
        return
    start = pos
    while pos < len(s) and s[pos].isdigit():
        pos += 1
    if pos == start:
        fail("expected a number or '('")


def term():
    global pos
    factor()
    while pos < len(s) and s[pos] in "*/":
        pos += 1
        factor()


def expr():
    global pos
    term()
    while pos < len(s) and s[pos] in "+-":
        pos += 1
        term()


if not s:
    fail("empty expression")
expr()
if pos != len(s):
    fail("unexpected character")
