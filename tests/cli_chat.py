#!/usr/bin/python3
"""cli_chat.py TESSERA MODEL_DIR WORK — `tessera chat` in a terminal (a
detached tmux session): a chat template given by --chat-template FILE
renders the history exactly as jinja2 does (as transformers'
apply_chat_template); Ctrl-C during a reply stops it, the partial reply
(a prefix of the uninterrupted greedy reply) stays in the history and the
prompt comes back; /reset starts over (the next prompt is the first one
again); Ctrl-C at the prompt ends the chat with status 0. The speeds line
is on a line of its own. Also `tessera run -p` with stdout and stderr on
one pipe: the text, then the speeds on their own line."""
import os
import re
import shutil
import subprocess
import sys
import time

import jinja2.sandbox

exe, model, work = sys.argv[1], sys.argv[2], sys.argv[3]
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
TEMPLATE = ("{% for m in messages %}{% if m.role == 'system' %}"
            "{{ m.content + '\\n\\n' }}{% elif m.role == 'user' %}"
            "{{ 'Question: ' + m.content + '\\n' }}{% else %}"
            "{{ 'Answer:' + m.content + '\\n' }}{% endif %}{% endfor %}"
            "{% if add_generation_prompt %}{{ 'Answer:' }}{% endif %}")
tpl_file = os.path.join(work, "qa.jinja")
open(tpl_file, "w").write(TEMPLATE)
SYSTEM = "The words of the book."
N = 200
args = [model, "--chat-template", tpl_file, "--system", SYSTEM, "-n", str(N),
        "--ignore-eos", "--verbose-prompt"]
env = dict(os.environ, TS_NUM_THREADS="2")


def render(msgs):
    e = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True,
                                                     lstrip_blocks=True)
    return e.from_string(TEMPLATE).render(messages=msgs,
                                          add_generation_prompt=True)


# the uninterrupted greedy reply to the first turn, and the stats line's
# place: `run` with stdout and stderr on one pipe
r = subprocess.run([exe, "run", *args, "-p", "In the beginning"], env=env,
                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                   text=True, timeout=120)
assert r.returncode == 0, r.stdout
full = r.stdout.split("prompt ids: ", 1)[1].split("\n", 1)[1]
full, stats = full.rsplit("\nprompt: ", 1)
assert re.match(r"\d+ tokens \(0 reused from the cache\) in [0-9.]+ s .*"
                rf"generation: {N - 1} tokens", stats), stats
assert len(full) > 200, full

sock = f"tessera-cli-chat-{os.getpid()}"


def tmux(*a):
    return subprocess.run(["tmux", "-L", sock, *a], capture_output=True,
                          text=True, timeout=30)


def pane():
    return tmux("capture-pane", "-p", "-J", "-S", "-", "-t", "chat").stdout


def wait_for(what, pred, timeout=60):
    end = time.time() + timeout
    while time.time() < end:
        text = pane()
        if pred(text):
            return text
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}:\n{pane()[-3000:]}")


def replies(text):
    """the stats lines: one after each reply, whole or stopped"""
    return len(re.findall(r"^prompt: .*tokens/s\)$", text, re.M))


def prompts(text):
    return re.findall(r"prompt text: (.*?)\nprompt ids: ", text, re.S)


quoted = " ".join("'" + a.replace("'", "'\\''") + "'" for a in [exe, "chat", *args])
tmux("-f", "/dev/null", "new-session", "-d", "-s", "chat", "-x", "250", "-y",
     "50")
tmux("set-option", "-g", "history-limit", "50000")
# the status line's marker is not in the command line as typed
tmux("send-keys", "-t", "chat",
     f"TS_NUM_THREADS=2 {quoted}; echo \"EX\"\"IT=$?\"", "Enter")
try:
    wait_for("the banner", lambda t: "Ctrl-C stops a reply" in t and
             t.rstrip().endswith(">"))
    # turn 1: stopped by Ctrl-C once some of the reply is out
    tmux("send-keys", "-t", "chat", "-l", "In the beginning")
    tmux("send-keys", "-t", "chat", "Enter")
    t = wait_for("the first reply", lambda t: "prompt ids: " in t and len(
        t.split("prompt ids: ", 1)[1].split("\n", 1)[-1].strip()) > 40)
    tmux("send-keys", "-t", "chat", "C-c")
    t = wait_for("the prompt after Ctrl-C", lambda t: "(stopped)" in t and
                 t.rstrip().endswith(">"))
    first = prompts(t)[0]
    msgs = [{"role": "system", "content": SYSTEM},
            {"role": "user", "content": "In the beginning"}]
    assert first == render(msgs), (first, render(msgs))
    st = re.findall(r"^prompt: .*generation: (\d+) tokens", t, re.M)
    assert len(st) == 1 and int(st[0]) < N - 1, (st, t[-2000:])
    # turn 2: the partial reply is in the history
    tmux("send-keys", "-t", "chat", "-l", "And God said")
    tmux("send-keys", "-t", "chat", "Enter")
    t = wait_for("the second reply", lambda t: replies(t) == 2 and
                 t.rstrip().endswith(">"))
    second = prompts(t)[1]
    head = render(msgs)
    assert second.startswith(head), (second, head)
    partial = second[len(head):].split("\nQuestion: And God said\n")[0]
    assert len(partial) > 20 and full.startswith(partial), (partial, full)
    msgs += [{"role": "assistant", "content": partial},
             {"role": "user", "content": "And God said"}]
    assert second == render(msgs), (second, render(msgs))
    reused = re.findall(r"\((\d+) reused from the cache\)", t)
    assert int(reused[-1]) > 0, reused
    # /reset: the next prompt is the first one again
    tmux("send-keys", "-t", "chat", "-l", "/reset")
    tmux("send-keys", "-t", "chat", "Enter")
    tmux("send-keys", "-t", "chat", "-l", "In the beginning")
    tmux("send-keys", "-t", "chat", "Enter")
    t = wait_for("the reply after /reset", lambda t: replies(t) == 3 and
                 t.rstrip().endswith(">"))
    assert prompts(t)[2] == first, (prompts(t)[2], first)
    # Ctrl-C at the prompt ends the chat
    tmux("send-keys", "-t", "chat", "C-c")
    t = wait_for("the end", lambda t: re.search(r"^EXIT=\d+", t, re.M))
    assert re.search(r"^EXIT=0$", t, re.M), t[-2000:]
    assert replies(t) == 3 and len(prompts(t)) == 3, t[-2000:]
finally:
    tmux("kill-server")
print("cli_chat: template, Ctrl-C mid-reply (partial reply kept), /reset, "
      "Ctrl-C at the prompt, the stats line ok")
