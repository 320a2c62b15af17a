// The REST endpoint the REST suites run against, in front of a real
// redis-server: plain JS in scripts/, so that the benchmark starts the same one.
export { startRest, type RestEndpoint, type RestStats } from '../../scripts/rest-endpoint.js';
