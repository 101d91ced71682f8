"""The loopback fleet (``edge-node loopback``): N real ``edge-node start`` daemons on one machine.

``config`` (its settings), ``netns`` (private namespaces and a bridge), ``link`` (rate, delay, loss),
``daemons`` (starting, watching and stopping one daemon process), ``fleet`` (the whole fleet's life and
its clean-up), ``progress`` (the live table or plain lines) and ``summary`` (JSON, Markdown, plot).
Nothing here trains: every node is a separate ``edge-node start`` process speaking real gRPC.
"""
