//! `laned serve --web`: a page that streams the microphone to a chosen
//! model, at `GET /`, with its script (`GET /app.js`) and the JavaScript
//! client it imports (`GET /laned.js`, `clients/js/laned.js`). Off by
//! default; the files are compiled in, so the binary serves them from
//! anywhere.

use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;

/// The page.
pub const INDEX_HTML: &str = include_str!("../web/index.html");
/// The page's script.
pub const APP_JS: &str = include_str!("../web/app.js");
/// The JavaScript client (`clients/js`).
pub const LANED_JS: &str = include_str!("../../clients/js/laned.js");

fn file(content_type: &'static str, body: &'static str) -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
}

/// `router` with the page's routes where `web` is on, else as it is.
pub(crate) fn routes<S: Clone + Send + Sync + 'static>(router: Router<S>, web: bool) -> Router<S> {
    if !web {
        return router;
    }
    router
        .route("/", get(|| async { file("text/html; charset=utf-8", INDEX_HTML) }))
        .route(
            "/app.js",
            get(|| async { file("text/javascript; charset=utf-8", APP_JS) }),
        )
        .route(
            "/laned.js",
            get(|| async { file("text/javascript; charset=utf-8", LANED_JS) }),
        )
}
