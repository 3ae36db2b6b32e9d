//! S3 settings the way the AWS tools take them: the `AWS_*` variables
//! (read by the `object_store` builder itself, `AWS_ENDPOINT_URL` and
//! `AWS_REGION` among them), else the profile `AWS_PROFILE` (default:
//! `default`) of `~/.aws/credentials` and `~/.aws/config` (or
//! `AWS_SHARED_CREDENTIALS_FILE` / `AWS_CONFIG_FILE`).

use std::path::PathBuf;

use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};

/// The profile's settings that the environment leaves unset.
pub fn apply_profile(mut builder: AmazonS3Builder) -> AmazonS3Builder {
    let profile = std::env::var("AWS_PROFILE").unwrap_or_else(|_| "default".to_string());
    let home = std::env::var_os("HOME").map(PathBuf::from);
    let file = |var: &str, name: &str| {
        std::env::var_os(var)
            .map(PathBuf::from)
            .or_else(|| home.as_ref().map(|h| h.join(".aws").join(name)))
    };
    // In ~/.aws/config a profile other than the default is `[profile NAME]`.
    let config_section = if profile == "default" {
        profile.clone()
    } else {
        format!("profile {profile}")
    };
    let sources = [
        (
            file("AWS_SHARED_CREDENTIALS_FILE", "credentials"),
            profile.clone(),
        ),
        (file("AWS_CONFIG_FILE", "config"), config_section),
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
