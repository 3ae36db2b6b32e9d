//! Multipart uploads a crash left unfinished in an S3 bucket: their parts
//! are stored (and billed) until aborted, and `object_store` has no call
//! that lists them. Listing is S3's `ListMultipartUploads`, signed with
//! `object_store`'s own `SigV4` signer; aborting is `object_store`'s.

use std::sync::Arc;

use object_store::aws::{AmazonS3, AwsAuthorizer};
use object_store::client::HttpRequestBody;
use object_store::multipart::MultipartStore;
use object_store::path::Path as Key;
use serde::Deserialize;

/// Pages of uploads listed at most in one clean-up (1,000 each).
const MAX_PAGES: usize = 100;

/// What the bucket's unfinished uploads are listed and aborted with.
pub struct S3Uploads {
    pub s3: Arc<AmazonS3>,
    /// `https://endpoint/bucket` (path style) or AWS's regional one.
    pub bucket_http: String,
    pub region: String,
    pub http: reqwest::Client,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Listing {
    #[serde(rename = "Upload", default)]
    uploads: Vec<Upload>,
    #[serde(default)]
    is_truncated: bool,
    #[serde(default)]
    next_key_marker: Option<String>,
    #[serde(default)]
    next_upload_id_marker: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Upload {
    key: String,
    upload_id: String,
}

fn generic(e: impl std::error::Error + Send + Sync + 'static) -> object_store::Error {
    object_store::Error::Generic {
        store: "S3",
        source: Box::new(e),
    }
}

impl S3Uploads {
    async fn page(
        &self,
        prefix: &str,
        markers: Option<(&str, &str)>,
    ) -> Result<Listing, object_store::Error> {
        let mut url = url::Url::parse(&self.bucket_http).map_err(generic)?;
        url.query_pairs_mut()
            .append_pair("prefix", prefix)
            .append_key_only("uploads");
        if let Some((key, id)) = markers {
            url.query_pairs_mut()
                .append_pair("key-marker", key)
                .append_pair("upload-id-marker", id);
        }
        let credential = self.s3.credentials().get_credential().await?;
        let mut request = http::Request::builder()
            .method("GET")
            .uri(url.as_str())
            .body(HttpRequestBody::empty())
            .map_err(generic)?;
        AwsAuthorizer::new(&credential, "s3", &self.region).try_authorize(&mut request, None)?;
        let mut send = self.http.get(url.as_str());
        for (name, value) in request.headers() {
            send = send.header(name, value);
        }
        let response = send.send().await.map_err(generic)?;
        let status = response.status();
        let text = response.text().await.map_err(generic)?;
        if !status.is_success() {
            return Err(object_store::Error::Generic {
                store: "S3",
                // The words object_store uses, which the error's message reads.
                source: format!("listing unfinished uploads: status code: {status}: {text}").into(),
            });
        }
        quick_xml::de::from_str(&text).map_err(generic)
    }

    /// Aborts every unfinished upload under `prefix`; returns their keys.
    pub async fn abort_all(&self, prefix: &str) -> Result<Vec<String>, object_store::Error> {
        let mut aborted = Vec::new();
        let mut markers: Option<(String, String)> = None;
        for _ in 0..MAX_PAGES {
            let page = self
                .page(
                    prefix,
                    markers.as_ref().map(|(k, i)| (k.as_str(), i.as_str())),
                )
                .await?;
            for upload in &page.uploads {
                self.s3
                    .abort_multipart(&Key::from(upload.key.as_str()), &upload.upload_id)
                    .await?;
                aborted.push(upload.key.clone());
            }
            match (
                page.is_truncated,
                page.next_key_marker,
                page.next_upload_id_marker,
            ) {
                (true, Some(k), Some(i)) => markers = Some((k, i)),
                _ => break,
            }
        }
        Ok(aborted)
    }
}
