// The status page's HTTP side (see status_page.h).
#include "daemon/status_page.h"

#include <civetweb.h>

#include <cstring>

namespace tierkv::daemon {

extern const char kStatusPageHtmlData[];  // status_page_html.cc (generated)
extern const unsigned long kStatusPageHtmlSize;

std::string_view StatusPageHtml() {
  return {kStatusPageHtmlData, kStatusPageHtmlSize};
}

int ServeStatusPage(mg_connection* conn) {
  const mg_request_info* info = mg_get_request_info(conn);
  if (info == nullptr || info->local_uri == nullptr) return 0;
  const bool page = std::strcmp(info->local_uri, "/") == 0 ||
                    std::strcmp(info->local_uri, "/status") == 0;
  if (!page) return 0;
  const bool head = std::strcmp(info->request_method, "HEAD") == 0;
  if (!head && std::strcmp(info->request_method, "GET") != 0) {
    mg_printf(conn,
              "HTTP/1.1 405 Method Not Allowed\r\nAllow: GET, HEAD\r\n"
              "Content-Length: 0\r\nConnection: close\r\n\r\n");
    return 405;
  }
  const std::string_view html = StatusPageHtml();
  // Nothing from elsewhere: scripts and styles only inline, fetches only
  // to this listener (./metrics).
  mg_printf(conn,
            "HTTP/1.1 200 OK\r\n"
            "Content-Type: text/html; charset=utf-8\r\n"
            "Content-Length: %zu\r\n"
            "Cache-Control: no-cache\r\n"
            "X-Content-Type-Options: nosniff\r\n"
            "Content-Security-Policy: default-src 'none'; "
            "script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
            "connect-src 'self'; img-src data:; frame-ancestors 'none'\r\n"
            "Connection: close\r\n\r\n",
            html.size());
  if (!head) mg_write(conn, html.data(), html.size());
  return 200;
}

}  // namespace tierkv::daemon
