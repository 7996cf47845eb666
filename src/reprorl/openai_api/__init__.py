"""OpenAI's wire format: request bodies, replies, streaming chunks, errors and per-agent token histories.

Shared by `reprorl serve policy` and the agent proxy, which both speak it; nothing here serves.
"""
