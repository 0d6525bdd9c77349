"""Webhook signing secrets at rest (issue 32 item 7): envelope encryption. Each secret is sealed with a data key of its
own from KMS (GenerateDataKey, AES-256, under the stack's key WEBHOOK_SECRETS_KEY_ID, with an encryption context that
names the purpose) and AES-256-GCM; t_webhook_endpoint keeps 'env1:<the data key, encrypted by KMS>:<nonce and
ciphertext>', never the secret. Creating an endpoint and rotating its secret only seal (kms:GenerateDataKey: the
answer carries the new secret once); the sender alone opens (kms:Decrypt), to sign, keeping opened data keys in memory
for its run only. Without a key (the local runtime, never in AWS) a secret is kept as it is; a stored 'whsec_' value
(from before this, or local) is read as it is, and sealed by the operators' step (Webhooks.seal_clear_secrets) or its
next rotation."""

from __future__ import annotations

import base64
import os
from collections.abc import Callable
from typing import Any

from cryptography.hazmat.primitives.ciphers.aead import AESGCM

PREFIX = "env1:"
_CONTEXT = {"purpose": "hotledger-webhook-secret"}
_AAD = b"hotledger-webhook-secret"


def _kms() -> Any:
    import boto3

    return boto3.client("kms")


class SecretBox:
    def __init__(self, key_id: str | None, client: Callable[[], Any] = _kms):
        self.key_id, self._client, self._kms = key_id or None, client, None
        self._opened_keys: dict[bytes, bytes] = {}  # encrypted data key -> the data key, for this process's life

    def _kms_client(self) -> Any:
        if self._kms is None:
            self._kms = self._client()
        return self._kms

    @staticmethod
    def sealed(stored: str) -> bool:
        return stored.startswith(PREFIX)

    def seal(self, secret: str) -> str:
        """The secret as t_webhook_endpoint keeps it."""
        if self.key_id is None:
            return secret
        kms = self._kms_client()
        data_key = kms.generate_data_key(KeyId=self.key_id, KeySpec="AES_256", EncryptionContext=_CONTEXT)
        nonce = os.urandom(12)
        sealed = AESGCM(data_key["Plaintext"]).encrypt(nonce, secret.encode(), _AAD)
        return PREFIX + ":".join(
            base64.b64encode(part).decode() for part in (data_key["CiphertextBlob"], nonce + sealed)
        )

    def open(self, stored: str) -> str:
        """The secret, from what t_webhook_endpoint keeps (the sender's only)."""
        if not self.sealed(stored):
            return stored
        encrypted_key, box = (base64.b64decode(part) for part in stored.removeprefix(PREFIX).split(":"))
        data_key = self._opened_keys.get(encrypted_key)
        if data_key is None:
            kms = self._kms_client()
            data_key = kms.decrypt(CiphertextBlob=encrypted_key, EncryptionContext=_CONTEXT)["Plaintext"]
            if len(self._opened_keys) > 1000:
                self._opened_keys.clear()
            self._opened_keys[encrypted_key] = data_key
        return AESGCM(data_key).decrypt(box[:12], box[12:], _AAD).decode()
