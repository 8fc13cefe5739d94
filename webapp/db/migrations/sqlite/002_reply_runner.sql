-- Which front end runs a pending reply, and until when its lease holds (renewed as the reply is saved):
-- a starting front end stops only its own pending replies and those whose lease ran out.
ALTER TABLE messages ADD COLUMN runner TEXT;
ALTER TABLE messages ADD COLUMN lease_until REAL;
