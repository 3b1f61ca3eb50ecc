"""What every server process (API, recorder, worker) shares beyond the contract: settings
(``AMPTRAIN_*``), logging, the one Redis client factory and every key name, the job
state machine's enums, worker presence and the telemetry stream writer."""
