"""kubetune inside other projects' frameworks: :mod:`kubetune.integrations.llama_stack`, llama-stack's
post-training provider (docs/llama-stack.md). Nothing here is imported by kubetune itself except the jobs server,
which serves llama-stack's post-training routes with the same field mapping."""
