"""The calculator tool-use task of tests/e2e/test_tooluse.sh.

  tooluse.py gen DIR N_TRAIN N_HELDOUT SEED
      DIR/train.jsonl   N_TRAIN conversations (OpenAI messages): a user asks for a calculation
                        in one of several phrasings, the assistant answers with one tool call
                        {"name": add|sub|mul|div, "arguments": {"a": A, "b": B}};
      DIR/heldout.txt   N_HELDOUT user prompts, one a line (for loom generate --chat --prompts);
      DIR/expected.jsonl the call each held-out prompt must produce.
      A random tenth of 10..999 is held out: the held-out prompts use only numbers that no
      training conversation contains, so a correct call needs the model to copy the digits
      from the prompt (no number can be recalled from training).
  tooluse.py score OUT.jsonl EXPECTED.jsonl
      OUT.jsonl is loom generate --prompts output (one {"text": ...} line a prompt). A reply is
      correct when its first line parses as JSON (Python's json) and equals the expected call:
      the tool name and both arguments, exactly. Prints "correct K of N", then "tool K of N":
      the replies that are a well-formed call ({"name", "arguments": {"a": int, "b": int}}) of
      the right tool, whatever the numbers, and a few wrong replies.
  tooluse.py pairs DIR N SEED PAIR_SEED
      DIR/pairs.jsonl   N preference pairs (TRL's conversational format: "prompt" a user message,
                        "chosen" the assistant's correct call, "rejected" a corrupted one: one
                        argument with a wrong number (a digit changed, or the digits swapped),
                        or the wrong tool), on the training numbers of `gen DIR ... SEED` (the
                        held-out numbers never occur), drawn with PAIR_SEED.
  tooluse.py calc < CALL
      The calculator tool environment of GRPO's multi-turn case (finetune.env.command): reads
      a call {"name": add|sub|mul|div, "arguments": {"a": A, "b": B}} on stdin, prints the
      result (div: integer division); an ill-formed call prints an error message.
  tooluse.py envdata DIR N SEED
      DIR/env.jsonl   N conversations for the multi-turn case on the training numbers: the user
                      asks for a calculation, the assistant calls the tool, the tool answers,
                      the assistant replies with the number (the reference GRPO rewards).
  tooluse.py checkdump DUMP.jsonl
      LOOM_TEST_GRPO_DUMP's rows: in every row whose completion called the tool, the tool
      message's tokens ("T:...") have target -1 (masked out of the loss) and the tokens the
      model generated around it have targets; prints "masked K rows".
  tooluse.py text DIR N SEED
      DIR/text.txt: unrelated text (sentences about animals, places and numbers), documents
      separated by a line "%", to pretrain the base model on.
"""
import json
import os
import random
import sys

TOOLS = {
    "add": ["what is {a} plus {b}?", "add {a} and {b}", "{a} + {b} = ?", "compute the sum of {a} and {b}"],
    "sub": ["what is {a} minus {b}?", "from {a} subtract {b}", "{a} - {b} = ?", "the difference of {a} and {b}"],
    "mul": ["what is {a} times {b}?", "multiply {a} by {b}", "{a} * {b} = ?", "the product of {a} and {b}"],
    "div": ["what is {a} divided by {b}?", "divide {a} by {b}", "{a} / {b} = ?", "split {a} into {b} parts"],
}


def split_numbers(rng):
    """(training numbers by length, held-out numbers): a random tenth of 10..999 is held out; the
    training conversations draw 1, 2 and 3-digit numbers equally often (short ones too, which
    makes copying quicker to learn), the held-out prompts any held-out number."""
    nums = list(range(10, 1000))
    rng.shuffle(nums)
    held = set(nums[:99])
    by_len = [[n for n in range(lo, hi) if n not in held] for lo, hi in ((0, 10), (10, 100), (100, 1000))]
    return by_len, [sorted(held)]


def example(rng, nums):
    name = rng.choice(sorted(TOOLS))
    a, b = rng.choice(rng.choice(nums)), rng.choice(rng.choice(nums))
    prompt = rng.choice(TOOLS[name]).format(a=a, b=b)
    return prompt, {"name": name, "arguments": {"a": a, "b": b}}


def gen(out, n_train, n_heldout, seed):
    rng = random.Random(seed)
    train_nums, held_nums = split_numbers(rng)
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "train.jsonl"), "w") as f:
        for i in range(n_train):
            prompt, call = example(rng, train_nums)
            tc = {"id": f"call{i}", "type": "function",
                  "function": {"name": call["name"], "arguments": json.dumps(call["arguments"])}}
            msgs = [{"role": "user", "content": prompt},
                    {"role": "assistant", "content": None, "tool_calls": [tc]}]
            f.write(json.dumps({"messages": msgs}) + "\n")
    with open(os.path.join(out, "heldout.txt"), "w") as p, \
            open(os.path.join(out, "expected.jsonl"), "w") as e:
        for _ in range(n_heldout):
            prompt, call = example(rng, held_nums)
            p.write(prompt + "\n")
            e.write(json.dumps(call) + "\n")


def call_msg(call, i):
    tc = {"id": f"call{i}", "type": "function",
          "function": {"name": call["name"], "arguments": json.dumps(call["arguments"])}}
    return [{"role": "assistant", "content": None, "tool_calls": [tc]}]


def corrupt(rng, call):
    """The call with one mistake: a wrong number in one argument, or the wrong tool."""
    bad = json.loads(json.dumps(call))
    if rng.random() < 0.25:
        bad["name"] = rng.choice([t for t in sorted(TOOLS) if t != call["name"]])
        return bad
    k = rng.choice("ab")
    digits = list(str(bad["arguments"][k]))
    if len(digits) > 1 and digits[0] != digits[-1] and rng.random() < 0.5:
        digits[0], digits[-1] = digits[-1], digits[0]  # swapped, as the misses are
    else:
        i = rng.randrange(len(digits))
        digits[i] = rng.choice([d for d in "0123456789" if d != digits[i] and (i or d != "0"
                                                                                or len(digits) == 1)])
    bad["arguments"][k] = int("".join(digits))
    return bad


def pairs(out, n, seed, pair_seed):
    train_nums, held = split_numbers(random.Random(seed))
    held = set(held[0])
    rng = random.Random(pair_seed)
    with open(os.path.join(out, "pairs.jsonl"), "w") as f:
        for i in range(n):
            prompt, call = example(rng, train_nums)
            bad = corrupt(rng, call)
            while set(bad["arguments"].values()) & held:  # no held-out number anywhere
                bad = corrupt(rng, call)
            f.write(json.dumps({"prompt": [{"role": "user", "content": prompt}],
                                "chosen": call_msg(call, i),
                                "rejected": call_msg(bad, i)}) + "\n")


def text(out, n, seed):
    rng = random.Random(seed)
    animals = "cat dog horse heron otter fox badger owl wren beetle".split()
    plural = {"fox": "foxes"}
    places = "river hill forest meadow harbor village valley garden".split()
    verbs = "saw counted followed painted found carried".split()
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "text.txt"), "w") as f:
        for d in range(n):
            sents, seen = [], []
            for _ in range(rng.randint(2, 4)):
                k, what = rng.randint(0, 999), rng.choice(animals)
                what = plural.get(what, what + "s")
                sents.append(f"the {rng.choice(animals)} {rng.choice(verbs)} {k} {what} near the "
                             f"{rng.choice(places)}.")
                seen.append(f"{k} {what}")
            rng.shuffle(seen)
            sents.append("in all: " + ", ".join(seen) + ".")
            f.write(" ".join(sents) + "\n%\n")


def score(out_path, expected_path):
    expected = [json.loads(l) for l in open(expected_path)]
    outs = [json.loads(l) for l in open(out_path)]
    assert len(outs) == len(expected), f"{len(outs)} replies for {len(expected)} prompts"
    correct, tool, wrong = 0, 0, []
    for o in sorted(outs, key=lambda o: o["index"]):
        want = expected[o["index"]]
        reply = o["text"].split("\n")[0]
        try:
            got = json.loads(reply)
        except ValueError:
            got = None
        if got == want:
            correct += 1
        else:
            wrong.append(f"{o['prompt']!r} -> {reply!r}")
        args = got.get("arguments") if isinstance(got, dict) else None
        if (isinstance(args, dict) and got.get("name") == want["name"] and set(got) == {"name", "arguments"}
                and set(args) == {"a", "b"} and all(type(v) is int for v in args.values())):
            tool += 1
    print(f"correct {correct} of {len(expected)}")
    print(f"tool {tool} of {len(expected)}")
    for w in wrong[:5]:
        print("  wrong:", w)


def calc():
    try:
        call = json.loads(sys.stdin.read())
        a, b = call["arguments"]["a"], call["arguments"]["b"]
        ops = {"add": lambda: a + b, "sub": lambda: a - b, "mul": lambda: a * b,
               "div": lambda: a // b}
        print(ops[call["name"]]())
    except Exception as e:  # the model sees the error as the tool's answer
        print(f"error: {type(e).__name__}")


def envdata(out, n, seed):
    train_nums, _ = split_numbers(random.Random(seed))
    rng = random.Random(seed + 100)
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "env.jsonl"), "w") as f:
        for i in range(n):
            prompt, call = example(rng, train_nums)
            a, b = call["arguments"]["a"], call["arguments"]["b"]
            res = {"add": a + b, "sub": a - b, "mul": a * b, "div": a // max(b, 1)}[call["name"]]
            msgs = [{"role": "user", "content": prompt}] + call_msg(call, i) + [
                {"role": "tool", "content": str(res)}, {"role": "assistant", "content": str(res)}]
            f.write(json.dumps({"messages": msgs}) + "\n")


def checkdump(path):
    masked = 0
    for line in open(path):
        r = json.loads(line)
        if not r["tool_calls"]:
            continue
        x, y = r["inputs"], r["targets"]
        text = bytes(t for t in x if t < 256).decode("latin-1")
        k = text.find("\nT:")
        if k < 0:
            sys.exit(f"row {r['row']}: a tool call but no tool message in {text!r}")
        end = text.find("\n", k + 1)
        # positions k+1 .. end+2 (the tool message "T:...\n" and the assistant's opening "A:")
        # are predicted by targets k .. end+1
        if any(y[j] != -1 for j in range(k, end + 2)):
            sys.exit(f"row {r['row']}: the tool message {text[k + 1:end + 1]!r} has targets "
                     f"{y[k:end + 2]}")
        if y[k - 1] < 0 or (end + 3 < len(y) and y[end + 2] < 0):
            sys.exit(f"row {r['row']}: the generated tokens around the tool message are not "
                     f"trained on")
        masked += 1
    print(f"masked {masked} rows")


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "gen":
        gen(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
    elif cmd == "text":
        text(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    elif cmd == "pairs":
        pairs(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
    elif cmd == "calc":
        calc()
    elif cmd == "envdata":
        envdata(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    elif cmd == "checkdump":
        checkdump(sys.argv[2])
    elif cmd == "score":
        score(sys.argv[2], sys.argv[3])
    else:
        sys.exit(f"unknown command {cmd}")
