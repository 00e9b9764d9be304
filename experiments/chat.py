"""Talk to a policy: one prompt a line on stdin, its response on stdout (a prompt loop on a
terminal, or prompts piped in).

    python -m experiments.chat --policy=runs/tiny              # a run's newest checkpoint (or --step=N)
    echo "47+85" | python -m experiments.chat --policy=runs/tiny
    python -m experiments.chat --policy=/models/Qwen3-0.6B --max_new_tokens=256 --temperature=0.7

A prompt is rendered as the policy's task renders it:
  - a run on the built-in task: `47+85` (or `47+85=`) becomes the task's prompt (`<bos>47+85=`,
    operands zero-padded when the task pads them); the line printed is the response, then a tab,
    the value it states in the task's answer format and whether it is right:
    `231<TAB>= 132 (correct)`;
  - a run on a dataset task: the task's chat template and instruction (`task.dataset.prompt_style`, ...);
  - a Hugging Face directory: its chat template (`--prompt_style=instruct`) or the line's text as it
    is (`--prompt_style=raw`, the default when the tokenizer has no chat template; an export of a
    built-in-task run reads `<bos>47+85=`).
Each response is followed by an empty line. Decoding is greedy unless `--temperature` > 0; sampled
responses are reproducible from `--seed` (prompt i uses `fold_in(seed, i)`). A line the task cannot
render (a word for the arithmetic task, a prompt over the policy's max prompt length) is reported on
stderr (`error: ...`) and skipped. A problem outside what the built-in task trained on (operands of a
digit count outside [min_digits, max_digits], e.g. `3+4` for the tiny preset's 2-digit operands, or
an operator it was not trained on) is still answered, after a one-line `note: ...` on stderr saying
what is outside; on a terminal the task's prompt note (`task.prompt_note()`) is shown at the start.
"""

from __future__ import annotations

import sys

from absl import flags

from experiments import cli
from experiments import conversation

_POLICY = flags.DEFINE_string("policy", None, "training-run workdir or HF model directory", required=True)
_STEP = flags.DEFINE_integer("step", None, "checkpoint step of a run workdir (default: the newest that reads)")
_MAX_NEW = flags.DEFINE_integer("max_new_tokens", None, "response budget (default: the task's answer width, a "
                                "run's rollout.max_new_tokens, or generation_config.json's / 512)")
_TEMPERATURE = flags.DEFINE_float("temperature", 0.0, "sampling temperature (0 = greedy)")
_TOP_P = flags.DEFINE_float("top_p", 1.0, "nucleus sampling mass (1 = off)")
_SEED = flags.DEFINE_integer("seed", 0, "sampling seed")
_STYLE = flags.DEFINE_enum("prompt_style", "auto", ["auto", "instruct", "raw"],
                           "HF directories: chat template or the text as it is (auto: the template if there is one)")
_MAX_PROMPT = flags.DEFINE_integer("max_prompt_tokens", 2048, "longer prompts are refused (text policies)")


def main(argv):
    del argv
    conversation.check_sampling_flags(_TEMPERATURE.value, _TOP_P.value, _MAX_NEW.value)
    chat = conversation.make_chat(_POLICY.value, _STEP.value, max_new_tokens=_MAX_NEW.value, temperature=_TEMPERATURE.value,
                     top_p=_TOP_P.value, seed=_SEED.value, prompt_style=_STYLE.value,
                     max_prompt_tokens=_MAX_PROMPT.value)
    interactive = sys.stdin.isatty()
    if interactive:
        print(f"policy {_POLICY.value}: one prompt a line, Ctrl-D to end", file=sys.stderr)
        task = getattr(chat.prompts, "task", None)
        if task is not None:  # the built-in task says what it trained on
            print(task.prompt_note(), file=sys.stderr)
    while True:
        try:
            line = input("> " if interactive else "")
        except EOFError:
            break
        if not line.strip():
            continue
        try:
            notice = chat.notice(line)
            if notice is not None:  # outside what the task trained on: said, then answered
                print(notice, file=sys.stderr, flush=True)
            reply = chat.reply(line)
        except ValueError as e:  # a line the task cannot render: say so, keep talking
            print(f"error: {cli.one_line(e)}", file=sys.stderr)
            continue
        print(reply, end="\n\n", flush=True)


if __name__ == "__main__":
    cli.run(main)
