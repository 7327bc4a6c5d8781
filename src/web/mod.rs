//! The web page (SPEC §10): the front-end in `web/` (TypeScript, built by Vite into
//! `web/dist/`, committed) embedded in the binary, so the page needs nothing but the daemon's
//! listener. `GET /` is its `index.html`, `GET /assets/{file}` the rest (gzipped, as every
//! response of the API, for clients that accept it).

use axum::Router;
use axum::extract::Path;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

#[derive(rust_embed::Embed)]
#[folder = "web/dist"]
struct Assets;

/// The page's routes, for any router state.
pub fn routes<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new()
        .route("/", get(index))
        .route("/index.html", get(index))
        .route("/assets/{*file}", get(asset))
}

async fn index() -> Response {
    serve("index.html")
}

async fn asset(Path(file): Path<String>) -> Response {
    serve(&format!("assets/{file}"))
}

fn serve(path: &str) -> Response {
    let Some(file) = Assets::get(path) else {
        return (StatusCode::NOT_FOUND, "no such file\n").into_response();
    };
    let mime = file.metadata.mimetype().to_owned();
    // Asset names carry a hash of their content: cached for good. The page itself is asked
    // again each time, so a new daemon's assets are found.
    let cache = if path.starts_with("assets/") {
        "public, max-age=31536000, immutable"
    } else {
        "no-cache"
    };
    let mut response = file.data.into_owned().into_response();
    let headers = response.headers_mut();
    if let Ok(mime) = HeaderValue::from_str(&mime) {
        headers.insert(header::CONTENT_TYPE, mime);
    }
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static(cache));
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    // The page loads nothing from elsewhere, and the browser is told so.
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'self'; img-src 'self' data:; style-src 'self' 'unsafe-inline'; \
             connect-src 'self'; frame-ancestors 'none'",
        ),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_is_embedded_and_every_asset_it_names_is_too() {
        let index = Assets::get("index.html").expect("web/dist/index.html is embedded");
        let html = String::from_utf8_lossy(&index.data);
        for reference in html
            .split(['"', '\''])
            .filter(|s| s.contains("assets/"))
            .map(|s| s.trim_start_matches("./").trim_start_matches('/'))
        {
            assert!(
                Assets::get(reference).is_some(),
                "{reference} is not embedded"
            );
        }
        // Nothing from elsewhere.
        assert!(
            !html.contains("http://") && !html.contains("https://"),
            "{html}"
        );
    }
}
