//! How a table turns its values into bytes: JSON via serde, or protobuf via
//! prost (for CSI messages kept as they came).

use std::fmt;
use std::marker::PhantomData;

use serde::Serialize;
use serde::de::DeserializeOwned;

/// The codec tag stored in each record file, so a record written by one
/// codec is never decoded by another.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CodecId(pub u8);

impl CodecId {
    /// [`Json`].
    pub const JSON: CodecId = CodecId(1);
    /// [`Prost`].
    pub const PROST: CodecId = CodecId(2);
}

impl fmt::Display for CodecId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            CodecId::JSON => f.write_str("json"),
            CodecId::PROST => f.write_str("prost"),
            CodecId(n) => write!(f, "codec {n}"),
        }
    }
}

/// Encodes and decodes values of `T`. Error strings must not contain the
/// value (records may hold parameters); the built-in codecs say only where
/// and what kind of problem.
pub trait Codec<T>: Send + Sync + 'static {
    /// The tag written into record files; ids 1 and 2 are taken by [`Json`]
    /// and [`Prost`], 128 and up are free for drivers.
    const ID: CodecId;
    /// The bytes of `value`.
    fn encode(value: &T) -> Result<Vec<u8>, String>;
    /// The value in `bytes`.
    fn decode(bytes: &[u8]) -> Result<T, String>;
}

/// JSON through serde: readable records, tolerant of added fields with
/// `#[serde(default)]`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Json;

impl<T: Serialize + DeserializeOwned> Codec<T> for Json {
    const ID: CodecId = CodecId::JSON;

    fn encode(value: &T) -> Result<Vec<u8>, String> {
        // Serialisation errors come from type rules ("key must be a
        // string"), not from values.
        serde_json::to_vec(value).map_err(|e| e.to_string())
    }

    fn decode(bytes: &[u8]) -> Result<T, String> {
        // serde_json's messages can quote values; keep only the position.
        serde_json::from_slice(bytes).map_err(|e| {
            format!(
                "JSON {:?} error at line {} column {}",
                e.classify(),
                e.line(),
                e.column()
            )
        })
    }
}

/// Protobuf through prost, for CSI messages (requests, capabilities).
#[derive(Debug, Clone, Copy, Default)]
pub struct Prost;

impl<T: prost::Message + Default> Codec<T> for Prost {
    const ID: CodecId = CodecId::PROST;

    fn encode(value: &T) -> Result<Vec<u8>, String> {
        Ok(value.encode_to_vec())
    }

    fn decode(bytes: &[u8]) -> Result<T, String> {
        // prost's errors name the field and the wire problem, not values.
        T::decode(bytes).map_err(|e| format!("protobuf: {e}"))
    }
}

/// Marker tying a value type to its codec inside [`crate::Table`].
pub(crate) type Marker<T, C> = PhantomData<fn() -> (T, C)>;

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
    struct Rec {
        secret_param: String,
        n: u64,
    }

    #[test]
    fn json_errors_do_not_quote_values() {
        let bytes = br#"{"secret_param":"hunter2","n":"not-a-number"}"#;
        let err = <Json as Codec<Rec>>::decode(bytes).unwrap_err();
        assert!(
            !err.contains("hunter2") && !err.contains("not-a-number"),
            "{err}"
        );
        assert!(err.contains("line 1"), "{err}");
    }

    #[test]
    fn prost_round_trips_a_message() {
        #[derive(Clone, PartialEq, prost::Message)]
        struct Msg {
            #[prost(string, tag = "1")]
            volume_id: String,
            #[prost(int64, tag = "2")]
            bytes: i64,
        }
        let m = Msg {
            volume_id: "vol-1".into(),
            bytes: 1 << 30,
        };
        let enc = <Prost as Codec<Msg>>::encode(&m).unwrap();
        assert_eq!(<Prost as Codec<Msg>>::decode(&enc).unwrap(), m);
        assert!(<Prost as Codec<Msg>>::decode(&[0xff, 0xff, 0xff]).is_err());
    }

    #[test]
    fn ids_display_by_name() {
        assert_eq!(CodecId::JSON.to_string(), "json");
        assert_eq!(CodecId::PROST.to_string(), "prost");
        assert_eq!(CodecId(200).to_string(), "codec 200");
    }
}
