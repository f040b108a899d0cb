"""The bottom layer, shared by every other (docs/architecture.md, Layers): the error taxonomy
(`errors`, one class per wire code), `TopicPartition`, child processes stopped by PID
(`child_process`) and the command-line options the CLI and the jobs share (`cli_options`).
Imports nothing of pymq's."""
