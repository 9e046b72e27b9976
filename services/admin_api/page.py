"""The usage page served at `/`: one self-contained HTML document (static/usage.html with its CSS and JS
inlined, no CDN, no build), meant to be kept open on a team's wall screen as well as a laptop.

It asks for a viewer token (or reads `?token=`, then drops it from the address bar and keeps it in
sessionStorage), then shows a summary strip (GPUs in use of all per generation, claims waiting, the oldest
wait, open critical alerts) over panels in a grid: the queue grouped by tenant and reason (/v1/waiting; a
group's claims when it is opened), open alerts folded by kind with their counts (/v1/alerts/counts; a
kind's alerts when it is opened), the fleet over time (/v1/usage/history, SVG stacked areas per flavor, a
tenant's on click), usage against quota (/v1/usage, with each tenant's fair share, past use and when it
halves, and the cohort tree with used / nominal per level) and the node map (/v1/nodes, a cell per GPU and MIG
slice, by generation). The strip's numbers are the panels' own data, never fetched apart. The queue and
alert tables sort by any column (keyboard too) and filter by tenant, flavor and kind; the filters, the
sorting, the opened alert kinds and the history's window live in the URL, so a wall screen is set up once.

Live: it reads /v1/events (server-sent events over the broker's own events, with fetch so the token
travels as a header) and applies a claim's devices to the node map, and so to the strip, as its status
arrives; other panels are fetched again at most every 0.5 s, and only those an event touched. Without the
stream (no bus in this process, or it dropped) it polls every 5 s and tries the stream again. Everything
from the API is inserted with textContent, never as HTML. Each panel's render time is kept in
`window.renderTimes`.
"""

from pathlib import Path

STATIC = Path(__file__).with_name("static")


def _page() -> str:
    """Read once, at import: the document is the same for every request."""
    html = (STATIC / "usage.html").read_text(encoding="utf-8")
    css = (STATIC / "usage.css").read_text(encoding="utf-8")
    js = (STATIC / "usage.js").read_text(encoding="utf-8")
    if "</script" in js.lower() or "</style" in css.lower():
        raise ValueError("the usage page's script or style would end its own element")
    return html.replace("/*CSS*/", css).replace("/*JS*/", js)


USAGE_PAGE = _page()
