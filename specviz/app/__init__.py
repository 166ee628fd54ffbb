"""The app's plain-Python half, testable without a browser: `settings` (limits, checks), `stacks` (shared
models, decoders), `sessions` (one visitor's state, the bound on live sessions), `race` (Compare),
`words` (captions, coloured text, tables, the race's verdict), `panels` (why it is fast, is it lossless),
`bench_panel` (a saved benchmark of the stack on screen), `replay` (recordings in the app), `live` (live mode
getting ready, and which stack it runs), `server_policy` (what a public server allows), `events` (the handlers) and
`texts` (help texts and CSS). `app.py` at the repository root keeps the page: layout and wiring. The app is the top
layer, which nothing imports: it may import analysis/, backends/, bench/, cpu/, decode/, models/, peers/, plots/,
profile/, recording/ and stack/.
"""
