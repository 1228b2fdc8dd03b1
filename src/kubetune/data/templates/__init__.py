"""Chat templates: a small registry of named templates, and the tokenizer's own template.

A template turns a conversation into text *and* tells which characters are trained: every trained
assistant answer is its content plus the template's end-of-turn token (``<|im_end|>``, ``<|eot_id|>``,
``</s>``, ...), so the model learns to stop.

Registry templates (``chatml``, ``llama3``, ``mistral``, ``gemma``, ``phi3``) exist twice, and a test
keeps the two identical: as Jinja (with ``{% generation %}`` markers; this is what is saved with the
tokenizer and what inference renders) and as a plain-Python renderer that returns the text and the
trained character spans in one pass, which is what makes preparation fast.

When the tokenizer brings its own template, :func:`resolve_template` first checks whether it renders
exactly like a registry template on a set of probe conversations; if so the fast renderer is used.
Otherwise :class:`JinjaTemplate` renders with the tokenizer itself and finds each answer's span by
rendering the conversation prefix before it (or from ``{% generation %}`` markers when the template has
them), counting conversations whose prefix does not render consistently with the whole.
"""


from .base import Message, Rendered, Template, TemplateRowError
from .registry import CHAT_TEMPLATES, ChatTemplate, template_names
from .tokenizer import JinjaTemplate, resolve_template, unrendered_tool_name

__all__ = [
    "CHAT_TEMPLATES",
    "ChatTemplate",
    "JinjaTemplate",
    "Message",
    "Rendered",
    "Template",
    "TemplateRowError",
    "resolve_template",
    "template_names",
    "unrendered_tool_name",
]
