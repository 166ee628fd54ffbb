"""Loading a model: where a spec's files are (locations; chunked: model files shipped in parts), loading them in a
precision (load; precision, whose `auto` reads this machine's profile), and how a prompt is fed to the model
(prompt_format). It may import profile/, decode/, backends/ and cpu/."""
