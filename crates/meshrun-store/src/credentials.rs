//! S3 settings the way the AWS tools take them: the `AWS_*` variables
//! (read by the `object_store` builder itself, `AWS_ENDPOINT_URL` and
//! `AWS_REGION` among them), else the profile `AWS_PROFILE` (default:
//! `default`) of `~/.aws/credentials` and `~/.aws/config` (or
//! `AWS_SHARED_CREDENTIALS_FILE` / `AWS_CONFIG_FILE`). Credentials from
//! the cloud host's instance metadata service only with
//! `MESHRUN_S3_INSTANCE_METADATA=1`.

use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;

use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey, AwsCredential};
use object_store::{CredentialProvider, StaticCredentialProvider};

use crate::error::{NoCredentials, StoreError};

/// `var`, else `~/.aws/<name>`.
fn aws_file(var: &str, name: &str) -> Option<PathBuf> {
    std::env::var_os(var)
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".aws").join(name)))
}

fn credentials_file() -> Option<PathBuf> {
    aws_file("AWS_SHARED_CREDENTIALS_FILE", "credentials")
}

/// The profile's settings that the environment leaves unset.
pub fn apply_profile(mut builder: AmazonS3Builder) -> AmazonS3Builder {
    let profile = std::env::var("AWS_PROFILE").unwrap_or_else(|_| "default".to_string());
    // In ~/.aws/config a profile other than the default is `[profile NAME]`.
    let config_section = if profile == "default" {
        profile.clone()
    } else {
        format!("profile {profile}")
    };
    let sources = [
        (credentials_file(), profile.clone()),
        (aws_file("AWS_CONFIG_FILE", "config"), config_section),
    ];
    for (path, section) in sources {
        let Some(ini) = path.and_then(|p| ini::Ini::load_from_file(p).ok()) else {
            continue;
        };
        let Some(props) = ini.section(Some(section.as_str())) else {
            continue;
        };
        for (name, key) in [
            ("aws_access_key_id", AmazonS3ConfigKey::AccessKeyId),
            ("aws_secret_access_key", AmazonS3ConfigKey::SecretAccessKey),
            ("aws_session_token", AmazonS3ConfigKey::Token),
            ("region", AmazonS3ConfigKey::Region),
            ("endpoint_url", AmazonS3ConfigKey::Endpoint),
        ] {
            // AWS_DEFAULT_REGION, like AWS_REGION, beats a profile's region.
            let set = builder.get_config_value(&key).is_some()
                || (matches!(key, AmazonS3ConfigKey::Region)
                    && builder
                        .get_config_value(&AmazonS3ConfigKey::DefaultRegion)
                        .is_some());
            if !set {
                if let Some(value) = props.get(name) {
                    builder = builder.with_config(key, value);
                }
            }
        }
    }
    builder
}

/// The variable that lets the S3 client ask the cloud host's instance
/// metadata service (169.254.169.254) for credentials.
pub const INSTANCE_METADATA_VAR: &str = "MESHRUN_S3_INSTANCE_METADATA";

/// What `object_store` would use for credentials, decided the way its
/// `AmazonS3Builder::build` decides: the first of static keys, a web
/// identity token with a role, a container's credentials URI (ECS, EKS),
/// and, when none of these is given, the instance metadata service. That
/// last one meshrun asks only when the user says so
/// ([`INSTANCE_METADATA_VAR`]): anywhere but a cloud host the request goes
/// out to an address on the host's network, and its refusal would be
/// reported as bad credentials that were never given. Without any source
/// (and no opt-in) the client gets credentials that refuse every request
/// before it is sent, saying what is missing: making the client sends
/// nothing, and a URL that is only named (a path joined to it) still works.
pub fn require_source(builder: AmazonS3Builder) -> Result<AmazonS3Builder, StoreError> {
    let set = |key: AmazonS3ConfigKey| builder.get_config_value(&key).is_some();
    let given = set(AmazonS3ConfigKey::AccessKeyId)
        || set(AmazonS3ConfigKey::SecretAccessKey)
        || (set(AmazonS3ConfigKey::WebIdentityTokenFile) && set(AmazonS3ConfigKey::RoleArn))
        || set(AmazonS3ConfigKey::ContainerCredentialsRelativeUri)
        || (set(AmazonS3ConfigKey::ContainerCredentialsFullUri)
            && set(AmazonS3ConfigKey::ContainerAuthorizationTokenFile));
    // Checked whatever the source, so that a mistyped value is never
    // silently ignored.
    let allowed = instance_metadata_allowed()?;
    if given || allowed {
        return Ok(builder);
    }
    let unsigned = builder
        .get_config_value(&AmazonS3ConfigKey::SkipSignature)
        .is_some_and(|v| yes(&v) == Some(true));
    if unsigned {
        // Unsigned requests need no credentials, but the listing of
        // unfinished uploads signs its own: an empty key, not the
        // instance-metadata provider the builder would make.
        let empty = AwsCredential {
            key_id: String::new(),
            secret_key: String::new(),
            token: None,
        };
        return Ok(builder.with_credentials(Arc::new(StaticCredentialProvider::new(empty))));
    }
    let missing = NoCredentials {
        endpoint: builder
            .get_config_value(&AmazonS3ConfigKey::S3Endpoint)
            .or_else(|| builder.get_config_value(&AmazonS3ConfigKey::Endpoint)),
        profile: profile_seen(),
    };
    Ok(builder.with_credentials(Arc::new(Refuse(missing))))
}

/// Credentials that refuse every request, before it is sent.
#[derive(Debug)]
struct Refuse(NoCredentials);

/// `object_store`'s `#[async_trait]` method, written out (this crate does
/// not depend on `async-trait`).
impl CredentialProvider for Refuse {
    type Credential = AwsCredential;

    fn get_credential<'life0, 'async_trait>(
        &'life0 self,
    ) -> Pin<Box<dyn Future<Output = object_store::Result<Arc<AwsCredential>>> + Send + 'async_trait>>
    where
        'life0: 'async_trait,
        Self: 'async_trait,
    {
        let refused = self.0.clone();
        Box::pin(async move {
            Err(object_store::Error::Generic {
                store: "S3",
                source: Box::new(refused),
            })
        })
    }
}

/// `1`/`0` and the other words `object_store` takes for its own switches.
fn yes(value: &str) -> Option<bool> {
    match value.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "on" | "yes" | "y" => Some(true),
        "" | "0" | "false" | "off" | "no" | "n" => Some(false),
        _ => None,
    }
}

/// Whether the user allowed the instance metadata service.
fn instance_metadata_allowed() -> Result<bool, StoreError> {
    let Some(value) = std::env::var_os(INSTANCE_METADATA_VAR) else {
        return Ok(false);
    };
    let value = value.to_string_lossy().into_owned();
    yes(&value).ok_or(StoreError::BadSetting {
        name: INSTANCE_METADATA_VAR,
        value,
        accepted: "1 (ask the cloud host's instance metadata service for credentials) or 0 \
                   (do not; the default), or true/false, yes/no, on/off",
    })
}

/// What the profile files held, for the message of a shell without
/// credentials: the profile and the credentials file looked in.
fn profile_seen() -> String {
    let profile = std::env::var("AWS_PROFILE").unwrap_or_else(|_| "default".to_string());
    match credentials_file() {
        Some(path) if path.exists() => format!(
            "profile '{profile}' in '{}' has no aws_access_key_id",
            path.display()
        ),
        Some(path) => format!("'{}' does not exist", path.display()),
        None => "HOME is unset, so there is no ~/.aws/credentials".to_string(),
    }
}
