-- The reference store's hit, as seeds/000 describes it: INCRBY, then PTTL,
-- and PEXPIRE when the key has no TTL. KEYS[1] = key, ARGV = windowMs, amount.
local count = redis.call('INCRBY', KEYS[1], ARGV[2])
local ttl = redis.call('PTTL', KEYS[1])
if ttl < 0 then
  redis.call('PEXPIRE', KEYS[1], ARGV[1])
  ttl = tonumber(ARGV[1])
end
return { count, ttl }
