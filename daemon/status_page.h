// The built-in status page: a static HTML+JS page (daemon/status_page.html,
// embedded at build time) served at "/" and "/status" on the metrics
// listener. The page reads ./metrics itself every 2 s, so the daemon serves
// nothing but bytes fixed at build time: no state, no query parameters.
#pragma once

#include <string_view>

struct mg_connection;

namespace tierkv::daemon {

// The page, as embedded (status_page.html).
std::string_view StatusPageHtml();

// A civetweb begin_request callback: answers GET/HEAD of "/" and "/status"
// with the page (a Content-Security-Policy that allows no external asset)
// and returns the HTTP status; returns 0 for every other request, which
// civetweb then serves (prometheus-cpp's /metrics).
int ServeStatusPage(mg_connection* conn);

}  // namespace tierkv::daemon
