"""The Composer types: events, time and the timer, state, callbacks, the logger, exceptions.

Internal: import the public names from :mod:`trainbus`. Nothing here knows about threads or
event loops.
"""
