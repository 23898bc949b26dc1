"""gpt-explain --serve: a local page that runs one training step at a time and draws it.

page.html (package data) holds the page: HTML, CSS and a script that asks the local server
for one step at a time (POST /api/step) and draws the report it gets back; changing the
block, head or position redraws from the last report at once and applies to the next step.
Every number shown carries its exact value in a ``data-value`` attribute, so that a test
reading the page can compare it with the report. server.py is the HTTP server.
"""
