#!/usr/bin/python3
"""Reference renderer for chat templates.

Renders exactly as Hugging Face transformers' apply_chat_template(...,
tokenize=False) does (transformers/utils/chat_template_utils.py,
_compile_jinja_template): a jinja2 ImmutableSandboxedEnvironment with
trim_blocks, lstrip_blocks, the loopcontrols extension and the
{% generation %} tag, the raise_exception and strftime_now globals, and
transformers' tojson filter (json.dumps, ensure_ascii=False). It needs only
Debian's python3-jinja2, not transformers.

  hf_render.py --tokenizer DIR --conversations FILE
      renders each {name, messages, add_generation_prompt, extra} of FILE;
      prints a JSON list of {name, text} or {name, error}
  hf_render.py --tokenizer DIR --messages-file F [--add-generation-prompt]
      F: a list of messages, or {"messages": [...], other variables};
      prints the prompt exactly (no newline added)
  hf_render.py --snippets FILE
      renders each {name, template, variables} of FILE; prints a JSON list
      of {name, text} or {name, error}
"""
import argparse
import json
import os
import sys
from datetime import datetime

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

SPECIAL_TOKENS = ["bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"]


class GenerationTag(jinja2.ext.Extension):
    """transformers' {% generation %} tag (AssistantTracker): renders its body."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


def make_env():
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(format):
        return datetime.now().strftime(format)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[GenerationTag, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def token_text(value):
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    return None


def load_tokenizer(directory, name="default"):
    """(template source, special tokens map) as transformers loads them."""
    with open(os.path.join(directory, "tokenizer_config.json"), encoding="utf-8") as f:
        config = json.load(f)
    jinja_path = os.path.join(directory, "chat_template.jinja")
    json_path = os.path.join(directory, "chat_template.json")
    if os.path.exists(jinja_path):
        with open(jinja_path, encoding="utf-8") as f:
            template = f.read()
    elif os.path.exists(json_path):
        with open(json_path, encoding="utf-8") as f:
            template = json.load(f)["chat_template"]
    else:
        template = config.get("chat_template")
    if isinstance(template, list):
        template = {t["name"]: t["template"] for t in template}[name]
    if not isinstance(template, str):
        raise SystemExit(f"{directory}: no chat template")
    special = {}
    for key in SPECIAL_TOKENS:
        text = token_text(config.get(key))
        if text:
            special[key] = text
    extra = [token_text(t) for t in config.get("additional_special_tokens") or []]
    extra = [t for t in extra if t is not None]
    if extra:
        special["additional_special_tokens"] = extra
    return template, special


def render(env, source, messages, add_generation_prompt, variables):
    variables = dict(variables)
    tools = variables.pop("tools", None)
    documents = variables.pop("documents", None)
    return env.from_string(source).render(
        messages=messages, tools=tools, documents=documents,
        add_generation_prompt=add_generation_prompt, **variables)


def result(name, fn):
    try:
        return {"name": name, "text": fn()}
    except Exception as e:  # noqa: BLE001 - every failure is a result
        return {"name": name, "error": f"{type(e).__name__}: {e}"}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokenizer")
    p.add_argument("--conversations")
    p.add_argument("--messages-file")
    p.add_argument("--add-generation-prompt", action="store_true")
    p.add_argument("--snippets")
    args = p.parse_args()
    env = make_env()
    out = sys.stdout.buffer
    if args.snippets:
        with open(args.snippets, encoding="utf-8") as f:
            snippets = json.load(f)
        results = [result(s["name"], lambda s=s: env.from_string(s["template"]).render(**s.get("variables", {})))
                   for s in snippets]
        out.write(json.dumps(results, ensure_ascii=False).encode("utf-8"))
        return
    if not args.tokenizer:
        p.error("--tokenizer DIR is required")
    source, special = load_tokenizer(args.tokenizer)
    if args.conversations:
        with open(args.conversations, encoding="utf-8") as f:
            conversations = json.load(f)
        results = []
        for c in conversations:
            variables = {**special, **c.get("extra", {})}
            results.append(result(c["name"], lambda c=c, v=variables: render(
                env, source, c["messages"], c.get("add_generation_prompt", False), v)))
        out.write(json.dumps(results, ensure_ascii=False).encode("utf-8"))
        return
    if args.messages_file:
        with open(args.messages_file, encoding="utf-8") as f:
            data = json.load(f)
        variables = dict(special)
        if isinstance(data, dict):
            messages = data.pop("messages")
            variables.update(data)
        else:
            messages = data
        out.write(render(env, source, messages, args.add_generation_prompt, variables).encode("utf-8"))
        return
    p.error("one of --conversations, --messages-file, --snippets is required")


if __name__ == "__main__":
    main()
