"""torch's TCPStore wire protocol, spoken without torch: a codec and a handler over a key space.

Temporary home (issue #14, phase A): these modules move into the store wing later.
"""
