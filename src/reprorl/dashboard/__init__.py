"""The dashboard: a read-only web app over the store — runs live, rollouts, comparisons, artifacts."""

from reprorl.dashboard.app import create_app
from reprorl.dashboard.app import create_app as create_dashboard
from reprorl.dashboard.security import Access
from reprorl.dashboard.server import DashboardServer, serve_dashboard

__all__ = ["Access", "DashboardServer", "create_app", "create_dashboard", "serve_dashboard"]
